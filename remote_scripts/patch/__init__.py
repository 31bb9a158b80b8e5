"""Writing the node's installed files: patch and roll back (hunks, backups, the site lock, pip's
RECORD), and capture of what is installed."""
