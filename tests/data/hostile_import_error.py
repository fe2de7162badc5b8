"""A port module that raises while it is imported."""

raise RuntimeError("this module cannot be imported")
