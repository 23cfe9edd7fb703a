# The data plane between sidecars: a consumer's queue-proxy-zl pulls an
# object from the producer's by its sealed reference, in chunks, several in
# flight (Zipline §4).
@0xdb58b1e59cd6dc5d;

using Go = import "/go.capnp";
$Go.package("dataplanecapnp");
$Go.import("github.com/ziptrail/ziptrail/internal/dataplane/capnp");

interface Producer {
  # open starts one of the object's allowed reads. The reader holds the
  # object in the producer's memory until the consumer releases it.
  # Up to prefetch bytes come back in head, so a small object takes one
  # round trip.
  open @0 (ref :Text, prefetch :UInt32) -> (reader :Reader, size :UInt64, bucket :Text, key :Text, head :Data);
  # extend keeps the referenced object alive until untilUnixMs.
  extend @1 (ref :Text, untilUnixMs :Int64) -> (ok :Bool);
}

interface Reader {
  # read returns up to length bytes at offset (a single message stays far
  # below Cap'n Proto's 64 MiB limit).
  read @0 (offset :UInt64, length :UInt32) -> (data :Data);
}
