"""Lab 07_ancestor_mask, the reference answer (notebook 7, section 3): the ancestor mask from the parents."""


def my_ancestor_mask(parents: list[int]) -> list[list[bool]]:
    """mask[i][j]: node j is node i or one of its ancestors (follow the parents up to the root, whose parent is -1)."""
    mask = []
    for node in range(len(parents)):
        row, walker = [False] * len(parents), node
        while walker >= 0:
            row[walker] = True
            walker = parents[walker]
        mask.append(row)
    return mask
