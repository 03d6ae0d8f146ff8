"""JoyAI-Image-Edit: the steps of its diffusers pipeline."""
