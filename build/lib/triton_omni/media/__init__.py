"""Media encoding and decoding with PyAV / Pillow: audio (WAV, FLAC, MP3, Opus, PCM), images, video."""
