"""Protocol buffer definitions of ax (``proto/ax/v1``) and their generated Python code."""
