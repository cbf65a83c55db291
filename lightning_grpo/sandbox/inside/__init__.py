"""The sandbox's inside: the modules that run in its processes, standard library only, bound read-only at
``/_sandbox`` (``boot.py`` is the first process, ``grader.py`` its test side, ``program.py`` the program's side)."""
