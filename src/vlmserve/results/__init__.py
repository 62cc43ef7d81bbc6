"""Results: one record per request, the typed run summary, a run's result, and the store.

The bottom of the package graph above `spec`: every producer (bench, plan, interop) writes these
types and every reader (report, sweep, calibrate) reads them; JSON is only their serialisation.
"""
