"""What a results folder holds: file names (layout), the append-only logs with one reader and one writer (log), and
what makes two result rows comparable (identity)."""
