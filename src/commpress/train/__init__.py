"""``commpress train``: a small GPT on real text, uncompressed vs compressed, same seed."""
