"""Benchmarks: the codecs (``commpress codecs``), the collectives (``commpress bench``), the
schedules printed (``commpress schedule``) and the cost model's sweeps (``commpress sim``)."""
