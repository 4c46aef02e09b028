"""Example ax tools; importing :mod:`ax_tools_demo.tools` registers them."""
