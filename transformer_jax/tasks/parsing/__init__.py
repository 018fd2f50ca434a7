"""English constituency parsing as a sequence-to-sequence task (paper §6.3): treebank
reading, linearized trees and their repair, the tree-constrained search, bracket F1."""
