"""The recipes that made the shipped weights: packages, so that a notebook imports their pieces."""
