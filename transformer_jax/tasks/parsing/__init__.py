"""English constituency parsing as a sequence-to-sequence task (paper §6.3): treebank reading
and linearizing (treebank), decoded outputs back into trees (repair), the tree-constrained
search (tree_constraint), bracket F1 (parseval); the task object that joins them (task)."""
