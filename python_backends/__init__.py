"""The library that triton-omni's step models call: runtime, AR engine, models, codecs, media."""
