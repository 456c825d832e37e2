//! [`SharedInformers`]: one informer per (type, resource, namespace, selectors), shared by
//! every controller of a manager.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use parking_lot::Mutex;

use super::handle::{Informer, InformerOptions};
use super::InformerError;
use crate::client::{Api, ApiResource, Client, DynamicObject};
use crate::object::Object;

/// Which objects of a resource an informer covers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Scope {
    /// One namespace; None: all namespaces (and always None for cluster-scoped resources).
    pub namespace: Option<String>,
    /// Only objects whose labels match this `labelSelector`; None: any labels.
    pub label_selector: Option<String>,
    /// Only objects whose selectable fields match this `fieldSelector`; None: any.
    pub field_selector: Option<String>,
}

impl Scope {
    /// Every object of the resource.
    pub fn all() -> Self {
        Scope::default()
    }

    /// Objects in one namespace.
    pub fn namespace(namespace: &str) -> Self {
        Scope {
            namespace: Some(namespace.into()),
            ..Scope::default()
        }
    }

    /// Only objects matching a label selector.
    pub fn labels(mut self, selector: &str) -> Self {
        self.label_selector = Some(selector.into());
        self
    }

    /// Only objects matching a field selector.
    pub fn fields(mut self, selector: &str) -> Self {
        self.field_selector = Some(selector.into());
        self
    }

    /// The form used as a sharing key: empty strings mean "unset", and a cluster-scoped
    /// resource has no namespace, so equivalent requests share one informer.
    fn normalized(mut self, resource: &ApiResource) -> Self {
        let clean = |s: Option<String>| s.map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
        self.namespace = clean(self.namespace).filter(|_| resource.namespaced);
        self.label_selector = clean(self.label_selector);
        self.field_selector = clean(self.field_selector);
        self
    }
}

/// When the informers of a [`SharedInformers`] start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StartPolicy {
    /// Each informer starts as soon as it is first requested.
    #[default]
    OnRequest,
    /// Informers start at [`SharedInformers::start`]; those requested later start at once.
    Explicit,
}

/// The informer factory of a manager: one informer per (object type, resource, namespace,
/// label selector, field selector), however many controllers ask for it and whenever they
/// ask. Cheap to clone: clones share the informers.
///
/// Shutting the factory down ([`SharedInformers::shutdown`], or dropping the last clone)
/// stops every informer and ends its watch.
#[derive(Clone)]
pub struct SharedInformers {
    inner: Arc<FactoryInner>,
}

struct FactoryInner {
    client: Client,
    defaults: InformerOptions,
    state: Mutex<FactoryState>,
}

struct FactoryState {
    informers: HashMap<FactoryKey, Entry>,
    started: bool,
    shut_down: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct FactoryKey {
    // A typed and a dynamic informer on the same resource hold different object types, so
    // they cannot share a cache.
    object_type: TypeId,
    resource: ApiResource,
    scope: Scope,
    /// Metadata-only and whole-object informers of a resource hold different objects too.
    metadata_only: bool,
}

struct Entry {
    /// An `Informer<K>` for the `K` in the key.
    informer: Box<dyn Any + Send + Sync>,
    control: Box<dyn Control>,
}

/// The type-erased lifecycle of an informer, so the factory can drive all of them.
trait Control: Send + Sync {
    fn start(&self);
    fn stop(&self);
    fn shutdown(&self) -> BoxFuture<'static, ()>;
    fn wait_synced(&self) -> BoxFuture<'static, Result<(), InformerError>>;
}

impl<K: Object> Control for Informer<K> {
    fn start(&self) {
        Informer::start(self);
    }
    fn stop(&self) {
        Informer::stop(self);
    }
    fn shutdown(&self) -> BoxFuture<'static, ()> {
        let me = self.clone();
        Box::pin(async move { me.shutdown().await })
    }
    fn wait_synced(&self) -> BoxFuture<'static, Result<(), InformerError>> {
        let me = self.clone();
        Box::pin(async move { me.wait_synced().await })
    }
}

impl SharedInformers {
    /// A factory whose informers start when first requested, with default options.
    pub fn new(client: Client) -> Self {
        SharedInformers::with_options(client, InformerOptions::default(), StartPolicy::OnRequest)
    }

    /// Informers whose caches leave out `metadata.managedFields` (see
    /// [`InformerOptions::strip_managed_fields`]), as Kubernetes' controller manager and
    /// scheduler keep theirs: field ownership is a large part of every object, and built-in
    /// controllers never read it.
    pub fn without_managed_fields(client: Client) -> Self {
        let defaults = InformerOptions {
            strip_managed_fields: true,
            ..InformerOptions::default()
        };
        SharedInformers::with_options(client, defaults, StartPolicy::OnRequest)
    }

    /// Informers with [`InformerOptions::lean`] caches, as the built-in controllers, the
    /// scheduler and the node agents use them.
    pub fn lean(client: Client) -> Self {
        SharedInformers::with_options(client, InformerOptions::lean(), StartPolicy::OnRequest)
    }

    /// A factory with these defaults for every informer (their selectors are ignored: the
    /// [`Scope`] of each request sets them).
    pub fn with_options(client: Client, defaults: InformerOptions, start: StartPolicy) -> Self {
        SharedInformers {
            inner: Arc::new(FactoryInner {
                client,
                defaults,
                state: Mutex::new(FactoryState {
                    informers: HashMap::new(),
                    started: start == StartPolicy::OnRequest,
                    shut_down: false,
                }),
            }),
        }
    }

    /// The client the informers use.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The informer for a k8s-openapi type (or a user type implementing its traits).
    /// Must be called within a Tokio runtime when the informer is to start now.
    pub fn typed<K>(&self, scope: Scope) -> Informer<K>
    where
        K: k8s_openapi::Resource + Object,
        K::Scope: 'static,
    {
        let resource = ApiResource::of::<K>();
        self.get_or_create(
            resource,
            scope,
            false,
            |client, namespace| match namespace {
                Some(ns) => Api::<K>::namespaced(client, ns),
                None => Api::<K>::all(client),
            },
        )
    }

    /// The informer for any resource, as [`DynamicObject`]s.
    pub fn dynamic(&self, resource: &ApiResource, scope: Scope) -> Informer<DynamicObject> {
        self.get_or_create(resource.clone(), scope, false, |client, namespace| {
            Api::dynamic(client, resource, namespace)
        })
    }

    /// The metadata-only informer for any resource: its cache holds each object's
    /// `PartialObjectMetadata` (see [`Api::metadata`]), for controllers that follow owners,
    /// finalizers or labels across many kinds, such as the garbage collector.
    pub fn metadata(&self, resource: &ApiResource, scope: Scope) -> Informer<DynamicObject> {
        self.get_or_create(resource.clone(), scope, true, |client, namespace| {
            Api::metadata(client, resource, namespace)
        })
    }

    fn get_or_create<K: Object>(
        &self,
        resource: ApiResource,
        scope: Scope,
        metadata_only: bool,
        make_api: impl FnOnce(Client, Option<&str>) -> Api<K>,
    ) -> Informer<K> {
        let scope = scope.normalized(&resource);
        let key = FactoryKey {
            object_type: TypeId::of::<K>(),
            resource,
            scope,
            metadata_only,
        };
        let mut state = self.inner.state.lock();
        if let Some(entry) = state.informers.get(&key) {
            if let Some(informer) = entry.informer.downcast_ref::<Informer<K>>() {
                return informer.clone();
            }
        }
        let options = InformerOptions {
            label_selector: key.scope.label_selector.clone(),
            field_selector: key.scope.field_selector.clone(),
            ..self.inner.defaults.clone()
        };
        let api = make_api(self.inner.client.clone(), key.scope.namespace.as_deref());
        let informer = Informer::new(api, options);
        if state.shut_down {
            // Hand out a stopped informer rather than failing: its `wait_synced` says why.
            informer.stop();
        } else if state.started {
            informer.start();
        }
        state.informers.insert(
            key,
            Entry {
                informer: Box::new(informer.clone()),
                control: Box::new(informer.clone()),
            },
        );
        informer
    }

    /// Starts every informer requested so far, and makes later requests start at once.
    /// Must be called within a Tokio runtime.
    pub fn start(&self) {
        let mut state = self.inner.state.lock();
        if state.shut_down {
            return;
        }
        state.started = true;
        for entry in state.informers.values() {
            entry.control.start();
        }
    }

    /// Waits until every informer requested so far has synced.
    pub async fn wait_synced(&self) -> Result<(), InformerError> {
        let waits: Vec<_> = self
            .inner
            .state
            .lock()
            .informers
            .values()
            .map(|e| e.control.wait_synced())
            .collect();
        for w in waits {
            w.await?;
        }
        Ok(())
    }

    /// How many distinct informers exist.
    pub fn len(&self) -> usize {
        self.inner.state.lock().informers.len()
    }

    /// Whether no informer has been requested.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops every informer and waits until their watches have ended. Informers requested
    /// afterwards come back stopped.
    pub async fn shutdown(&self) {
        let waits: Vec<_> = {
            let mut state = self.inner.state.lock();
            state.shut_down = true;
            // Signal all first, so the watches end together rather than one after another.
            for e in state.informers.values() {
                e.control.stop();
            }
            state
                .informers
                .values()
                .map(|e| e.control.shutdown())
                .collect()
        };
        futures::future::join_all(waits).await;
    }
}

impl Drop for FactoryInner {
    /// The last clone is gone: nobody can use these informers any more, so end their watches.
    fn drop(&mut self) {
        for entry in self.state.get_mut().informers.values() {
            entry.control.stop();
        }
    }
}
