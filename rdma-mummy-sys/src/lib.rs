//! Run-time loaded bindings to rdma-core's libibverbs and librdmacm.
#![warn(missing_docs)]
