"""The word-problem recipe: the demo target and drafter in weights/, from a problem generator up."""
