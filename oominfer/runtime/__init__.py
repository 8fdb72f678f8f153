"""Engine processes, whichever engine: start one on a lifeline, give it its environment,
wait for it to answer, read its log into a verdict, stop its whole tree.

verify and serve share this: what verification launched is launched the same way to serve.
"""
