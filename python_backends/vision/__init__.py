"""Vision: images and video in. Content parts of chat messages (chat.py), packed variable-length tower
calls over every request's images, frames and clips (packed.py, tower_step.py); families: qwen3_5_vl/
(image and video -> text on the AR engine), vjepa2/ (video embeddings)."""
