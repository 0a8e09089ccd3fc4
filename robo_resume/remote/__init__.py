"""Reading datasets from remote stores (the Hub, S3, GCS, HTTP) by byte ranges."""
