"""Stage `sample`: the built-in deterministic mini-crawl (Common Crawl layout) with ground truth, and the WARC writer and loopback server it uses."""
