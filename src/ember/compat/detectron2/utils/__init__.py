"""detectron2's and LiBai's ``utils``: ``events`` (and LiBai's ``checkpoint``)."""
