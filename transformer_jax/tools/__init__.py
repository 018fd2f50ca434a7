"""Inspection tools run from the command line (attention maps, parameter counts); nothing in
the library imports them."""
