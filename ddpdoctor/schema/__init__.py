"""The contracts between the three sides: evidence events, supervisor observations, the settings
passed into ranks, and the encodings they share. Pure Python: no torch, no rich."""
