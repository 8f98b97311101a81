"""Framework adapters: a backend's ops as framework operators (``torch``). Each imports its framework only
when called; nothing in cuplug imports this package."""
