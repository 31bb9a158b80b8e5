"""The only code that draws: console.py (per-host lines, live view, recap, JSON document, render_table),
rows.py (fact, GPU and fleet rows, progress bars: plain data, stdlib only), history.py (`fab history`).
Reads results and answers; imports nothing from the wire or the tasks. Import the submodule you need: this
package imports none of them, so rows.py stays usable without rich."""
