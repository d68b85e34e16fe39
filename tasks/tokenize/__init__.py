"""Stage `tokenize` (in progress): BPE tokenizer, Megatron-format .bin/.idx datasets and the weighted blend."""
