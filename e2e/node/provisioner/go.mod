module kandev.dev/local-provisioner

go 1.24
