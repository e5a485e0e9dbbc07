"""Unit tests of edgeloop.blobs that need no server: SigV4 against the S3 documentation's worked example,
FileBlobs and fetch_verified on a temp directory (python3 -m unittest discover -s clients/python/tests)."""

import hashlib
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from edgeloop.blobs import BlobError, BlobIntegrityError, FileBlobs, fetch_verified, open_blobs, sigv4_authorization  # noqa: E402


class SigV4(unittest.TestCase):
    def test_s3_documentation_example(self):
        # "Example: GET Object" of https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html
        headers = {
            "host": "examplebucket.s3.amazonaws.com",
            "range": "bytes=0-9",
            "x-amz-content-sha256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "x-amz-date": "20130524T000000Z",
        }
        auth = sigv4_authorization("GET", "https://examplebucket.s3.amazonaws.com/test.txt", headers,
                                   "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "us-east-1")
        self.assertEqual(auth, "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
                               "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
                               "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")


class Files(unittest.TestCase):
    def test_fetch_verified(self):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "p%3A/traj/k_0_0"))
            data = bytes(range(200))
            with open(os.path.join(d, "p%3A/traj/k_0_0/routed_experts.x"), "wb") as f:
                f.write(data)
            blobs = open_blobs(f"file://{d}")
            self.assertIsInstance(blobs, FileBlobs)
            ptr = {"key": "p%3A/traj/k_0_0/routed_experts.x", "sha256": hashlib.sha256(data).hexdigest(), "bytes": 200}
            self.assertEqual(fetch_verified(blobs, ptr, "k_0_0", "routed_experts"), data)
            with self.assertRaises(BlobIntegrityError) as e:
                fetch_verified(blobs, dict(ptr, sha256="0" * 64), "k_0_0", "routed_experts")
            self.assertEqual((e.exception.key, e.exception.field), ("k_0_0", "routed_experts"))
            self.assertEqual(str(e.exception), f"record k_0_0: blob of routed_experts ({ptr['key']}) has sha256 {ptr['sha256']}, the record says {'0' * 64}")
            with self.assertRaises(BlobIntegrityError) as e:
                fetch_verified(blobs, dict(ptr, key="p%3A/traj/k_0_0/none"), "k_0_0", "routed_experts")
            self.assertIn("is missing from file://", str(e.exception))
            with self.assertRaises(BlobError):
                blobs.get("../etc/passwd")


if __name__ == "__main__":
    unittest.main()
