"""One page, one identity: the URL policy (trackers, session ids and fragments dropped), the
request fingerprint taken from it, and the aliases a page's canonical link teaches the fleet."""
