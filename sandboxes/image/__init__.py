"""The images sandboxes run: the base image's recipe (`Dockerfile`) and its builder and
rootfs export (`base_image`), and a task's own Dockerfile built on this host
(`task_images`, its `FROM` reading and mapping in `dockerfile_refs`)."""
