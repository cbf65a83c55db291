"""The sandbox's inside: the modules that run in its processes, standard library only, bound read-only at
``/_sandbox``: ``boot.py`` (the first process), ``grader.py`` (its test side), ``collect.py`` (a test's
functions and classes, called as pytest would) and ``remote.py`` (the program's objects seen from there),
``values.py`` (literals in and out), ``arguments.py`` (what else a test's call passes
in), ``program.py`` (the program's process) and ``running.py`` (how it runs the code), ``hooks.py`` (process
mode's walls)."""
