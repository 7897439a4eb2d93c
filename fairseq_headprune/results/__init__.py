"""What a results folder holds and how it is written: the file names (layout), the append-only logs with their
one reader and one writer per folder (log), and what makes two result rows comparable (identity)."""
