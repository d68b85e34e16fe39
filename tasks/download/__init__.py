"""Stage `download`: Common Crawl WARC files over HTTP(S), curated Pile-style datasets."""
