"""Attention kernels and CPU settings: masks, bias types, biased and band attention, thread and
denormal control. The only place private torch ops are called (flash_ops, behind one availability
check with the math path as fallback). Nothing here knows about encodings."""
