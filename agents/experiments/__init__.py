"""Runners of the named reproductions (conf/repro/*.yaml), one module each."""
