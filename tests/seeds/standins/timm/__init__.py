"""A stand-in for what the examples take from ``timm``."""
