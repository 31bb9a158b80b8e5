"""The only code that draws: console.py (the Reporter; it re-exports its parts: richload, lines,
fittable, liveview, closing), rows.py (fact, GPU and fleet rows, progress bars: plain data, stdlib
only), history.py (`fab history`). Reads results and answers; imports nothing from the wire or the
tasks. Import the submodule you need: this package imports none of them, so rows.py stays usable
without rich."""
