"""Wan2.2: TI2V-5B, T2V-A14B, I2V-A14B (diffusers' WanPipeline and WanImageToVideoPipeline)."""
