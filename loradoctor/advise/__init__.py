"""Advice before a run: `recommend` (the config to copy for a card) and `lint` (what is wrong with a
config before launch). Both stand on the memory model (loradoctor/estimate) and the config readers."""
