"""Fish Audio S2-Pro: the dual-AR talker, its codec and its steps."""
