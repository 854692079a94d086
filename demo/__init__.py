"""`make demo`: the whole pipeline on one CPU box, one plain-language line per stage."""
