"""`epbuild reduce`: a failure cut to the smallest subgraph that fails the same way, and its repro folder."""
