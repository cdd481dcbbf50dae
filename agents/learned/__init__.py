"""Learned policies as data: their networks (feature extractors) and their files (no pickle). Below both
training, which writes them, and evaluation, which loads them, so neither imports the other for it."""
