"""The lowest layer: config and overrides, the command line, files (local or gs://), processes and
hosts, special token ids, exception types. Imports nothing else of ours.
"""
