"""Clinic appointments: slots with a capacity that is never exceeded."""
