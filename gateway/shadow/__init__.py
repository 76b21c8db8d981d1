"""Shadow copies: a finished request run again on the other route in idle GPU time, and its pair."""
