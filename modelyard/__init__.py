"""Modelyard's shared root: the error tree every layer raises, and the command line on top."""
