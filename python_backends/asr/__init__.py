"""Speech recognition: shared request parsing, long-audio segmentation, packing, CTC decoding and
transcript outputs; one subpackage per model family."""
