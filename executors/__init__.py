"""The real runtime: interprets schedule operations with torch on real devices."""
