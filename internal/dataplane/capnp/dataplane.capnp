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
  # deliver queues a direct message (docs/messaging.md) for the rank this
  # pod runs. auth is sealed with the namespace's key by the sender's
  # sidecar (a sidecar of another namespace cannot make one); small
  # messages travel in data, large ones as a reference to pull (ref, size).
  deliver @2 (msg :Message) -> (status :DeliverStatus);
}

struct Message {
  auth @0 :Text;
  session @1 :Text;
  group @2 :Text;
  from @3 :UInt32;
  to @4 :UInt32;
  tag @5 :Int64;
  seq @6 :UInt64;   # per sender and receiver, from 1
  data @7 :Data;
  ref @8 :Text;
  size @9 :UInt64;
}

enum DeliverStatus {
  queued @0;
  notHere @1;   # the receiver's rank does not run in this pod (left, or never joined here)
  foreign @2;   # auth is not of this pod's namespace
}

interface Reader {
  # read returns up to length bytes at offset (a single message stays far
  # below Cap'n Proto's 64 MiB limit).
  read @0 (offset :UInt64, length :UInt32) -> (data :Data);
}
