"""Reports built from stored results only: seed statistics, summaries, literature checks, plots,
the HTML report and the terminal (progress and tables)."""
