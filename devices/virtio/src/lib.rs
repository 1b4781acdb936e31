// SPDX-License-Identifier: Apache-2.0
//! virtio-pci transport (modern, 1.x) and the virtio-blk device.
