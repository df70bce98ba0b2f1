"""Fitting a profile: the cost terms of measured operations (terms), the
least-squares fit (costfit), the session that fits, judges held-out runs and
writes the profile (session), and the fit to published measurements (published,
publishedcal, knobs, unknowns, draftstep)."""
