"""Speech synthesis: text front ends, talkers (on the AR engine), codec decoders and vocoders."""
