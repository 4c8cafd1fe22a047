"""Lab 07_ancestor_mask (notebook 7, section 3): the ancestor mask of a draft tree.

Write the function below, then grade it: python -m pytest tutorials/labs -k ancestor_mask
"""


def my_ancestor_mask(parents: list[int]) -> list[list[bool]]:
    """mask[i][j] (a list of rows): True when node j is node i or one of its ancestors.

    `parents[i]` is node i's parent, -1 for the root (node 0); parents come before their children.
    Follow the parents up to the root. The grader ends by running the demo pair's tree loop with your
    mask in every verify pass.
    """
    raise NotImplementedError
