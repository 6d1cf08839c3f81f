"""What bertjax's programs show on the terminal: `cli` (a failure as one `error:` line
and exit status 2) and `progress` (bars on a terminal, timed log lines elsewhere)."""
