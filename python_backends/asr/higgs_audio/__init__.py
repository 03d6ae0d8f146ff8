"""Higgs Audio understanding (the `boson-multimodal` package's HiggsAudioModel): its Whisper audio tower packed, its outputs a Llama decoder's prompt."""
